"""A simulated fleet with its truth (sim), replayed through ingest and detection (drive),
scored against that truth (score): what bench/fleet.py and the scoreboard test use."""
