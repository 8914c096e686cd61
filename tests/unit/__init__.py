"""Unit tier: the library in this process (the in-memory store or a SQLite file at most), no server or child process."""
