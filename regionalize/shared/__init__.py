"""What every part of regionalize reads: the settled options and `[tool.regionalize]`, the site codes and
their pages, the sites and reports a run finds, and source files read and written faithfully. Imports
nothing else of regionalize."""
