"""Everything that runs inside the container: sent in at start, never imported by the host
except as files (protocol.py is the one wire format both ends import)."""
