"""Payload blobs: the names of blobs and the signed links agents fetch them with."""
