"""Selection: which verified candidates become training data (dedup, cap, decontamination)."""
