"""Engine adapters.  Each adapter is one module and imports its engine lazily."""
