"""Selection: which verified candidates become training data (rule, difficulty, decontam, dedup)."""
