"""The torch engine's image generation: diffusers pipelines, their first quotes by size,
and previews of a running batch."""
