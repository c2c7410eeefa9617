"""Sandbox images built with no container registry: the base chain and custom images."""
