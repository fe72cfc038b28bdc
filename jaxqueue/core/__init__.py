"""The base layer: system configuration and time scale, random words, status codes, versions.

Nothing here imports from the rest of the package.
"""
