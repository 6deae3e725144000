"""Trace-driven simulation of statecache's hit rates (``statecache simulate``).

``trace`` reads Mooncake-format request traces, ``workload`` generates
synthetic ones, ``geometry`` holds model presets, ``policies`` the placement
and eviction policies compared, ``simulator`` replays a trace through the
reference engine with the real pools and store.
"""
