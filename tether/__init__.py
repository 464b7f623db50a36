"""The `tether` command and the demo topology. Thin: it only composes the other packages."""
