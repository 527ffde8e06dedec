"""Tools in the chat: MCP servers the model may call, with the user's approval (issue #33).

config.py (the servers in mcp.json), host.py (the servers running, on the SDK's asyncio loop), guard.py (no server
process outlives the app), approvals.py ("always allow", --allow-tool), results.py (a result made safe for the
prompt), prompt.py and rounds.py (tools and results in Qwen3.5's own format), loop.py (the turn, round by round).
Qt-free; the window and `qwen-desk chat` drive it. docs/tools.md is the user's page.
"""
