"""The 1/N-refined mean field (Gast and Van Houdt): the expansion, its value at one
point and on a grid, and its results."""
