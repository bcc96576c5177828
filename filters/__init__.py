"""Stages 2 and 3 of LAIT: image content filtering (`lait filter`) and sentence detection and
cleaning (`lait clean`).

- `filters.image_stage`: `FilterConfig`, `ImageFilterStage` (images/ -> images_ok/)
- `filters.text_stage`: `CleanConfig`, `CleanStage` (pages/ -> candidates/, by image URL)
- `filters.html_images`: the texts a page gives its images (the images: `lait.pagereader`)
- `filters.command`: the `lait filter` and `lait clean` sub-commands
"""
