"""Stages 2 and 3 of LAIT: image content filtering (`lait filter`) and sentence detection and
cleaning (`lait clean`).

- `filters.image_stage`: `FilterConfig`, `ImageFilterStage` (images/ -> images_ok/)
- `filters.text_stage`: `CleanConfig`, `CleanStage` (pages/ -> candidates/, by image URL)
- `filters.html_images`: image URLs and their texts on a page, resolved as a crawler does
- `filters.command`: the `lait filter` and `lait clean` sub-commands
"""
