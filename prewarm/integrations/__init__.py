"""Integrations with the request routers people already run, each behind its own optional extra
(`pip install prewarm[litellm]`). Nothing else in prewarm imports them, nor their routers."""
