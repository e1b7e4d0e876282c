"""Conversation state in Redis: records, transitions, deadlines, sweeps and queries."""
