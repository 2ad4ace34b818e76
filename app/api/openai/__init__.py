"""OpenAI's chat, completions, embeddings and models routes, and the request bodies the
other APIs translate into."""
