"""Stages 2 and 3 of LAIT: image content filtering (`lait filter`) and sentence detection and
cleaning (`lait clean`).

- `lait.filters.config`: their settings, `FilterConfig` and `CleanConfig`
- `lait.filters.image_stage`: `ImageFilterStage` (images/ -> images_ok/)
- `lait.filters.text_stage`: `ExtractStage` (pages/ -> page_texts/) and `CleanStage`
  (page_texts/ -> candidates/, by image URL)
- `lait.filters.documents`: the document pass of `lait documents` (pages/ -> doc_pages/)
- `lait.filters.html_images`: the texts a page gives its images (the images: `lait.pagereader`)
"""
