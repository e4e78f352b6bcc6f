"""The agent: parent of one launched (or restored) process tree."""
