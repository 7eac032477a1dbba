"""One module per dashboard page; app.py lists them in st.navigation."""
