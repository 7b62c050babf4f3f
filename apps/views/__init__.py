"""The app's pages: Streamlit runs each script by path (``st.Page``); nothing imports them."""
