"""The embedding providers; each module imports its libraries only when it is loaded."""
