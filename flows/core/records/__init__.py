"""What a run leaves: cycle records, events, plots, trackers, manifests and the Hugging Face
export, a fork's lineage, and the journal read back (`inspect`, `runs`)."""
