"""The data stream ends with an error instead of spinning forever when nothing it reads can be
used (the trainer used to wait on its data workers until killed)."""

from __future__ import annotations

import pytest

from lait.train import data
from lait.train.data import ShardStream

pytestmark = pytest.mark.timeout(120)


def failing_decoder(sample):
    raise KeyError(f"{sample['__key__']}: no regions.npy")


def test_a_stream_whose_every_shard_is_unreadable_raises(tmp_path):
    urls = []
    for i in range(2):
        (tmp_path / f"{i:05d}.tar").write_bytes(b"not a tar at all" * 64)
        urls.append(str(tmp_path / f"{i:05d}.tar"))
    stream = iter(ShardStream(urls, failing_decoder, batch_size=2, seed=0, collate_kwargs={}))
    with pytest.raises(RuntimeError, match="not one sample could be read from 2 shard"):
        next(stream)


def test_a_stream_whose_samples_all_fail_to_decode_raises(tmp_path, monkeypatch):
    from kit.synthetic_shards import scene_samples, write_shards

    urls = [str(p) for p in write_shards(tmp_path, scene_samples(6, seed=0, width=32, height=32), per_shard=3)]
    monkeypatch.setattr(data, "MAX_FAILED_IN_A_ROW", 20)  # 6 samples: about three epochs
    stream = iter(ShardStream(urls, failing_decoder, batch_size=2, seed=0, collate_kwargs={}, shuffle_buffer=1))
    with pytest.raises(RuntimeError, match="20 samples in a row failed to decode; the last: .*no regions.npy"):
        next(stream)


def test_shards_open_as_webdataset_opens_them(tmp_path):
    """The tarfile reader takes what webdataset's did: a path, file://, and pipe:COMMAND."""
    from kit.synthetic_shards import scene_samples, write_shards

    (tar,) = write_shards(tmp_path, scene_samples(3, seed=0, width=32, height=32), per_shard=3)
    local = list(data.tar_samples(str(tar)))
    assert len(local) == 3 and all({"jpg", "txt"} <= set(s) for s in local)
    strip = [{k: v for k, v in s.items() if k != "__url__"} for s in local]
    for url in (f"file://{tar}", f"pipe:cat {tar}"):
        assert [{k: v for k, v in s.items() if k != "__url__"} for s in data.tar_samples(url)] == strip
    assert list(data.tar_samples(f"pipe:cat {tmp_path / 'missing.tar'}")) == []  # a warning, no sample
