"""Wire protocol and checkpoint states shared by coordinator and agents."""
