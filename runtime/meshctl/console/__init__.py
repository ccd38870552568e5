"""The console (`meshctl console`, docs/console.md): one web page for the people of the mesh.

main.py runs it, app.py holds the pages, web.py the HTTP side (headers, forms, CSRF, templates),
auth.py the sessions and logins, reads.py what it asks the bus as the logged-in person.
"""
