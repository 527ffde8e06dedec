"""The local API server: OpenAI- and Anthropic-compatible HTTP front ends on the serving core (UI-free).

app.py (routes) · security.py (the front door) · openai_api.py / anthropic_api.py / responses_api.py (wire formats,
their bodies read by requests/) · sse.py (streams) · errors.py · completion.py (the Backend the routes use and the
one completion step every API takes) · engine_backend.py (that Backend on an Engine's loaded model: the serving
core's ServingEngine, macapp.core.serving) · local_server.py (LocalServer: uvicorn on its own thread) ·
activity.py (the request list) · client_settings.py (what other tools need).
"""
