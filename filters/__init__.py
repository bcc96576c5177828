"""Stages 2 and 3 of LAIT: image content filtering (`lait filter`) and sentence detection and
cleaning (`lait clean`).

- `lait.filters.image_stage`: `FilterConfig`, `ImageFilterStage` (images/ -> images_ok/)
- `lait.filters.text_stage`: `CleanConfig`, `CleanStage` (pages/ -> candidates/, by image URL)
- `lait.filters.html_images`: the texts a page gives its images (the images: `lait.pagereader`)
"""
