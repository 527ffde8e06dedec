"""The local API server: OpenAI- and Anthropic-compatible HTTP front ends on the serving core (UI-free).

app.py (routes) · security.py (the front door) · openai_api.py / anthropic_api.py (wire formats) · sse.py
(streams) · errors.py · backend.py (steps shared by both APIs) · service.py (uvicorn on its own thread) ·
activity.py (the request list) · client_settings.py (what other tools need) · runner_backend.py.
"""
