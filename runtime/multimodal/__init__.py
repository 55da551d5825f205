"""Images for vision-language models: what a request carries (``inputs``), the model's Hugging
Face processor run on the API side (``processor``) and media read from a request (``media``).
See ``docs/multimodal.md``."""
