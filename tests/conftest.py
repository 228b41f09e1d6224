import sys
from pathlib import Path

# shared test helpers (streamlit_server.py) import from every test folder
sys.path.insert(0, str(Path(__file__).resolve().parent))
