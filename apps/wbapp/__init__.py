"""Helpers of the Streamlit app (``apps/main.py``): finding runs, cached models, next-token comparisons.

Kept apart from the page scripts in ``apps/views`` so the pages stay short and the logic is testable.
"""
