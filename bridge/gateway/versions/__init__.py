"""Versions: policy weights published, written to the model repository, loaded and verified.

    catalog.py    PolicyCatalog: which policies are served, their tensors, the live version
    publisher.py  Publisher: an upload -> a new version folder (uploads.py chunks, build.py the folder)
    service.py    PoliciesService: the tether.v1.Policies servicer (thin)
    verify.py     Fingerprint (Triton serves the file's weights), restoring a retired version

Nothing is re-exported: import the module you need.
"""
