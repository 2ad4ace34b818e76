"""Reranking (`/v1/rerank`) in the shape Cohere and Jina define."""
