"""Transports behind one small contract: chat platforms, HTTP, AINET and mq9 bridges."""
