"""`lmk-embed serve`: an OpenAI-compatible embeddings, landmarks and search service on Ray Serve.

`protocol` checks requests and shapes responses, `model` is what a replica holds, `app` the Ray
Serve deployment and its FastAPI routes, `command` the CLI. Needs the `serve` extra.
"""
