"""The farm's anomaly summaries turned into fixed-format acceptance drafts."""
