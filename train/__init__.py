"""ImageBERT (Qi et al., 2020) for lait: model, objectives, shard pipeline, multi-stage
pretraining, retrieval finetuning and evaluation.

Import the submodules you need (``lait.train.model``, ``lait.train.pretrain``...); this package imports
nothing heavy itself so that ``lait --help`` stays fast.
"""
