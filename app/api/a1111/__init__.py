"""AUTOMATIC1111's API (`/sdapi/v1/*`): txt2img, img2img, progress and options."""
