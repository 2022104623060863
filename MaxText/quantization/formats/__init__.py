"""Number formats: element grids and exact scale arithmetic (grids), NVFP4, Four Over Six."""
