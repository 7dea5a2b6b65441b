"""The OpenAI API: /v1/completions, /v1/chat/completions (tools, SSE), vLLM's /tokenize, /detokenize, /invocations. Routes: `api.router(ctx)`."""
