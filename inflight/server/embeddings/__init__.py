"""/v1/embeddings: the encoder model and decoder embeddings. Routes: `api.router(ctx)`."""
