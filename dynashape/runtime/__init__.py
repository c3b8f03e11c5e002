"""The compiled runtime: specializations of the generated code and the request state they run on."""
