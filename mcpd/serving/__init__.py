"""Inference serving: models behind the Open Inference Protocol on a Unix socket.

The service is `mcpd.serving.service.InferenceService`; this package imports nothing itself, so
that `mcpd.client` can use the datatype table without pulling in the HTTP server.
"""
