"""The launcher's parts (run.py is its command line): tuning with Optuna over packs of trials (tune)."""
