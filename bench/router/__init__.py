"""`prewarm bench router`: LiteLLM with prewarm's routing strategy against a static model_list (run.py)."""
