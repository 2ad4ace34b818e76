"""OpenAI's image generation and edits (`/v1/images/...`): bodies, uploads, streamed
partial images, and the files behind `response_format: url`."""
