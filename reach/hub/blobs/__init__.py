"""Payload blobs: large payloads kept by reference (``payload_ref``) in a directory or an
S3-compatible bucket, their records in the store, and the links agents fetch them with."""
