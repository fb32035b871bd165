"""SGLang: the server's lifecycle and launch command, and the capture patch it runs."""
