"""The Celery side of the hub: the app factory, the worker entry point, the publisher,
canvases and the embedded broker. With ``tasks/`` the only code that imports Celery.
"""
