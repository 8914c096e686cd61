"""Process tier: what runs as separate processes: commands, the README as written, races, kill -9, the benchmark."""
