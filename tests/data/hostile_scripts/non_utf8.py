# a script that is not UTF-8 and declares no encoding
name = "café"
print(name)
