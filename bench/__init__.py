"""``make bench``: dormant measured against floors taken in the same run (see ``bench/common.py``)."""
