"""OpenAI's Responses API: /v1/responses (create, stream, GET, DELETE; stored per API key). Routes: `api.router(ctx)`."""
