"""The lowest layer: errors, the profile and its sections, reports, safe files; imports nothing above it."""
