"""Streamlit dashboard: app.py with st.navigation and one page module per view."""
