"""The incidents app: detectors, incidents and their timelines, reliability statistics."""
