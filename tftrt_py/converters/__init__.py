"""The user-facing converters (TF2, TF1, online, summary) over the segmenter, the engine op and convert/."""
